#!/usr/bin/env bash
# add-to-moses.sh MOSES_DIR -- copy the CSLM feature function into a Moses
# checkout (mosesdecoder) and register it in moses/FF/Factory.cpp. It builds
# nothing: rebuild Moses afterwards with its usual bjam command.
# Running it again refreshes the copied sources; the registration is added once.
set -euo pipefail
moses=${1:?usage: add-to-moses.sh /path/to/mosesdecoder}
here=$(cd "$(dirname "$0")" && pwd)
ff=$moses/moses/FF
factory=$ff/Factory.cpp
[ -f "$factory" ] || { echo "add-to-moses.sh: $factory not found: is $moses a mosesdecoder checkout?" >&2; exit 1; }

cp "$here/CSLM.h" "$here/CSLM.cpp" "$here/cslm_ngrams.h" "$ff/"
cp "$here/../cpp/cslm_client.h" "$ff/cslm_client.h"
cp "$here/../cpp/cslm_client.cc" "$ff/cslm_client.cpp"   # Moses' Jamfile compiles moses/FF/*.cpp

if ! grep -q '"moses/FF/CSLM.h"' "$factory"; then
  sed -i '0,/^#include "moses\/FF\/Factory.h"/s//&\n#include "moses\/FF\/CSLM.h"/' "$factory"
fi
if ! grep -q 'MOSES_FNAME(CSLM);' "$factory"; then
  sed -i '0,/^  MOSES_FNAME(ExampleStatefulFF);/s//&\n  MOSES_FNAME(CSLM);/' "$factory"
fi
grep -q '"moses/FF/CSLM.h"' "$factory" && grep -q 'MOSES_FNAME(CSLM);' "$factory" \
  || { echo "add-to-moses.sh: could not register CSLM in $factory; add the include and MOSES_FNAME(CSLM); by hand" >&2; exit 1; }
echo "CSLM added to $moses; now rebuild Moses (e.g. ./bjam -j4 in $moses)"
