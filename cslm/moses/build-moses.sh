#!/usr/bin/env bash
# build-moses.sh MOSES_CHECKOUT [JOBS] -- add the CSLM and NNJM feature functions to a Moses
# checkout (add-to-moses.sh) and build, with bjam, only the programs that
# pipelines/Makefile uses, installed into MOSES_CHECKOUT/bin:
#   moses                                  the decoder
#   lmplz build_binary                     KenLM (the lm step)
#   extract score consolidate lexical-reordering-score
#                                          train-model.perl steps 4-9 (the phrases step)
#   extractor mert kbmira pro evaluator    mert-moses.pl (TUNER=mert, kbmira or pro)
# filter-model-given-input.pl needs no compiled program. JOBS: parallel compilations
# (default: the number of cores). Tested with mosesdecoder 34452895f
# (github.com/moses-smt/mosesdecoder); needs a C++ compiler and the Boost, zlib,
# bzip2 and lzma headers (Debian/Ubuntu: apt-get install g++ libboost-all-dev
# zlib1g-dev libbz2-dev liblzma-dev). See docs/moses-feature.md.
set -euo pipefail
usage="usage: build-moses.sh MOSES_CHECKOUT [JOBS]"
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "$usage" >&2; exit 2; }
moses=$1
jobs=${2:-$(nproc 2>/dev/null || echo 2)}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "build-moses.sh: JOBS must be a positive whole number, not '$jobs' ($usage)" >&2; exit 2; }
[ -d "$moses" ] || { echo "build-moses.sh: $moses is not a directory ($usage)" >&2; exit 1; }
[ -f "$moses/Jamroot" ] && [ -x "$moses/bjam" ] \
  || { echo "build-moses.sh: $moses has no Jamroot and bjam: is it a mosesdecoder checkout?" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
moses=$(cd "$moses" && pwd)
[[ $moses =~ [[:space:]] ]] && { echo "build-moses.sh: $moses contains white space, which bjam cannot build in" >&2; exit 1; }

"$here/add-to-moses.sh" "$moses" > /dev/null   # idempotent: sources refreshed, hooks added once

programs=(moses lmplz build_binary extract score consolidate lexical-reordering-score extractor mert kbmira pro evaluator)
# A first build names the installed files' absolute paths as bjam targets (a bare name
# such as `mert` would name a Moses subproject, its folder). bjam does not re-check an
# installed file against its sources once it exists, and Moses's own install target
# (prefix-bin) would also compile moses2 and every other program, 15 minutes more: a
# checkout that has them all rebuilds the decoder alone, the one program that holds the
# features, as its main target (moses-cmd//moses: only what changed is compiled), and
# copies it into bin/.
targets=()
for p in "${programs[@]}"; do [ -x "$moses/bin/$p" ] || targets+=("$moses/bin/$p"); done
cd "$moses"
if [ ${#targets[@]} -gt 0 ]; then
  echo "build-moses.sh: CSLM and NNJM added to $moses; building ${#targets[@]} programs with bjam -j $jobs" >&2
  ./bjam -j "$jobs" --with-boost=/usr -q --no-xmlrpc-c "${targets[@]}"
else
  echo "build-moses.sh: CSLM and NNJM added to $moses; rebuilding the decoder with bjam -j $jobs" >&2
  ./bjam -j "$jobs" --with-boost=/usr -q --no-xmlrpc-c moses-cmd//moses
  built=$(find moses-cmd/bin -type f -name moses -perm -u+x -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
  [ -n "$built" ] || { echo "build-moses.sh: bjam built no moses-cmd/bin/.../moses in $moses" >&2; exit 1; }
  cp "$built" bin/moses.tmp && mv bin/moses.tmp bin/moses
fi
# the decoder must be newer than every source the feature added, or it was not rebuilt
for f in moses/FF/CSLM.cpp moses/FF/NNJM.cpp moses/FF/CSLMShared.cpp moses/FF/CSLMBuffer.cpp moses/FF/cslm_backend.cpp moses/FF/cslm_local.cpp \
         moses/FF/cslm_kernels.cpp moses/FF/cslm_modeldir.cpp moses/FF/cslm_client.cpp moses/FF/cslm_json.cpp; do
  [ bin/moses -nt "$f" ] || { echo "build-moses.sh: bin/moses is older than $f after bjam; run ./bjam --with-boost=/usr -q --no-xmlrpc-c in $moses" >&2; exit 1; }
done

missing=()
for p in "${programs[@]}"; do [ -x "bin/$p" ] || missing+=("bin/$p"); done
[ ${#missing[@]} -eq 0 ] || { echo "build-moses.sh: bjam finished but ${missing[*]} missing in $moses" >&2; exit 1; }
echo "build-moses.sh: built $moses/bin/{$(IFS=,; echo "${programs[*]}")}; run the pipeline with MOSES=$moses" >&2
