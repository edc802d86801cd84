#!/usr/bin/env bash
# inputs-stamp.sh write STAMP FILE...   record what each FILE holds: its SHA-256, size, time
#                                       stamp, inode and path, a line each
# inputs-stamp.sh check STAMP FILE...   print "yes" when every FILE holds what STAMP recorded:
#                                       the same size, time stamp and inode, or, when those
#                                       changed, the same SHA-256 (STAMP then takes the new ones,
#                                       so the files are hashed once per copy); print nothing
#                                       otherwise (no STAMP, a FILE missing, other text)
#
# The Makefile asks `check` while it reads itself: a prepared set whose raw corpora still hold
# their text does not depend on their time stamps, so a corpus copied again (new time stamps,
# the same text) re-runs nothing, and a dry run (make -n) says so.
set -u
usage="usage: inputs-stamp.sh write|check STAMP FILE..."
[ $# -ge 3 ] || { echo "$usage" >&2; exit 2; }
mode=$1 stamp=$2
shift 2

stats() { stat -L -c '%s %Y %i %n' -- "$@" 2>/dev/null; }
hashes() { sha256sum -- "$@" 2>/dev/null | cut -d' ' -f1; }
# the stamp's lines for FILE...: "SHA256 SIZE MTIME INODE PATH", or nothing if a file cannot be read
record() {
  local s h
  s=$(stats "$@") && h=$(hashes "$@") || return 1
  [ "$(wc -l <<< "$s")" -eq $# ] && [ "$(wc -l <<< "$h")" -eq $# ] || return 1
  paste -d' ' <(printf '%s\n' "$h") <(printf '%s\n' "$s")
}
save() {  # atomically, so that a stamp is whole or absent
  local tmp
  tmp=$(mktemp "$stamp.XXXXXX") && printf '%s\n' "$1" > "$tmp" && mv -f "$tmp" "$stamp"
}

case $mode in
  write)
    lines=$(record "$@") || { echo "inputs-stamp.sh: cannot read $*" >&2; exit 1; }
    save "$lines" || { echo "inputs-stamp.sh: cannot write $stamp" >&2; exit 1; }
    ;;
  check)
    [ -f "$stamp" ] || exit 0
    old=$(cat -- "$stamp") || exit 0
    now=$(stats "$@") || exit 0
    if [ "$now" = "$(cut -d' ' -f2- <<< "$old")" ]; then
      echo yes
      exit 0
    fi
    new=$(record "$@") || exit 0
    if [ "$(cut -d' ' -f1,5- <<< "$new")" = "$(cut -d' ' -f1,5- <<< "$old")" ]; then
      save "$new" 2>/dev/null
      echo yes
    fi
    ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
exit 0
