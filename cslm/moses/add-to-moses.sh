#!/usr/bin/env bash
# add-to-moses.sh MOSES_DIR -- copy the CSLM and NNJM feature functions into a Moses
# checkout (mosesdecoder), register them in moses/FF/Factory.cpp, and hook the
# n-gram buffer (CSLMBuffer.h) into moses/SearchNormal.cpp (the normal stack search),
# moses/BitmapContainer.cpp and moses/SearchCubePruning.cpp (cube pruning). It builds nothing:
# rebuild Moses afterwards with its usual bjam command.
# Running it again refreshes the copied sources; registration and hook are added once.
set -euo pipefail
usage="usage: add-to-moses.sh MOSES_CHECKOUT"
[ $# -eq 1 ] || { echo "$usage" >&2; exit 2; }
moses=$1
[ -d "$moses" ] || { echo "add-to-moses.sh: $moses is not a directory ($usage)" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
ff=$moses/moses/FF
factory=$ff/Factory.cpp
[ -f "$factory" ] || { echo "add-to-moses.sh: $factory not found: is $moses a mosesdecoder checkout?" >&2; exit 1; }

search=$moses/moses/SearchNormal.cpp
[ -f "$search" ] || { echo "add-to-moses.sh: $search not found: is $moses a mosesdecoder checkout?" >&2; exit 1; }

cp "$here/CSLM.h" "$here/CSLM.cpp" "$here/CSLMBuffer.h" "$here/CSLMBuffer.cpp" "$here/cslm_ngrams.h" \
   "$here/NNJM.h" "$here/NNJM.cpp" "$here/CSLMShared.h" "$here/CSLMShared.cpp" "$here/cslm_affiliation.h" "$ff/"
for part in cslm_backend cslm_local cslm_kernels cslm_modeldir cslm_client cslm_json; do
  cp "$here/../cpp/$part.h" "$ff/$part.h"
  cp "$here/../cpp/$part.cc" "$ff/$part.cpp"   # Moses' Jamfile compiles moses/FF/*.cpp
done

if ! grep -q '"moses/FF/CSLM.h"' "$factory"; then
  sed -i '0,/^#include "moses\/FF\/Factory.h"/s//&\n#include "moses\/FF\/CSLM.h"/' "$factory"
fi
if ! grep -q 'MOSES_FNAME(CSLM);' "$factory"; then
  sed -i '0,/^  MOSES_FNAME(ExampleStatefulFF);/s//&\n  MOSES_FNAME(CSLM);/' "$factory"
fi
if ! grep -q '"moses/FF/NNJM.h"' "$factory"; then
  sed -i '0,/^#include "moses\/FF\/CSLM.h"/s//&\n#include "moses\/FF\/NNJM.h"/' "$factory"
fi
if ! grep -q 'MOSES_FNAME(NNJM);' "$factory"; then
  sed -i '0,/^  MOSES_FNAME(CSLM);/s//&\n  MOSES_FNAME(NNJM);/' "$factory"
fi
for name in CSLM NNJM; do
  grep -q "\"moses/FF/$name.h\"" "$factory" && grep -q "MOSES_FNAME($name);" "$factory" \
    || { echo "add-to-moses.sh: could not register $name in $factory; add the include and MOSES_FNAME($name); by hand" >&2; exit 1; }
done
# The buffer's hook: hold new hypotheses, flush after each stack (see CSLMBuffer.h).
if ! grep -q 'CSLMBuffer' "$search"; then
  perl -0p -e '
    s{(#include "SearchNormal.h"\n)}{$1#include "moses/FF/CSLMBuffer.h"\n};
    s{(\n\s*ProcessOneHypothesis\(\*\*h\);\n)([ \t]*)(return true;)}{$1$2CSLMBuffer::Flush();  // the CSLM buffer: score before the next stack is pruned\n$2$3};
    s{\n(\s*)(newHypo->EvaluateWhenApplied\(estimatedScore\);)}{\n$1// the CSLM buffer: held, then evaluated and added to its stack at the flush\n$1if (CSLMBuffer::Hold(newHypo, estimatedScore, m_hypoStackColl[newHypo->GetWordsBitmap().GetNumWordsCovered()])) return;\n$1$2};
  ' "$search" > "$search.cslm.tmp"
  [ "$(grep -c 'CSLMBuffer' "$search.cslm.tmp")" = 3 ] \
    || { rm -f "$search.cslm.tmp"; echo "add-to-moses.sh: could not hook the CSLM buffer into $search (a Moses version this script does not know?)" >&2; exit 1; }
  mv "$search.cslm.tmp" "$search"
fi
# Cube pruning's side of the buffer: ask for each new cube's corner when it is built, score
# the queue before a stack's cubes are initialised, and ask ahead of a cube's successors.
cube=$moses/moses/BitmapContainer.cpp
cubesearch=$moses/moses/SearchCubePruning.cpp
for f in "$cube" "$cubesearch"; do
  [ -f "$f" ] || { echo "add-to-moses.sh: $f not found: is $moses a mosesdecoder checkout?" >&2; exit 1; }
done
if ! grep -q 'CSLMBuffer' "$cube"; then
  perl -0p -e '
    s{(#include "BitmapContainer.h"\n)}{$1#include "moses/FF/CSLMBuffer.h"\n};
    s{(\n\s*m_hypotheses.push_back\(\*iter\);\n\s*\}\n)(\s*)(return;)}{$1$2CSLMBuffer::Cube(m_hypotheses, m_translations, m_parent.GetWordsBitmap());  // the CSLM buffer: ask for the corner\n$2$3};
    s{(\n(\s*)std::sort\(m_hypotheses.begin\(\), m_hypotheses.end\(\), orderer\);\n)}{$1$2CSLMBuffer::Cube(m_hypotheses, m_translations, m_parent.GetWordsBitmap());  // the CSLM buffer: ask for the corner\n};
    s{(BackwardsEdge::PushSuccessors\(const size_t x, const size_t y\)\n\{\n)}{$1  CSLMBuffer::Successors(m_hypotheses, m_translations, m_parent.GetWordsBitmap(), x, y);  // the CSLM buffer: ask ahead\n};
  ' "$cube" > "$cube.cslm.tmp"
  [ "$(grep -c 'CSLMBuffer' "$cube.cslm.tmp")" = 4 ] \
    || { rm -f "$cube.cslm.tmp"; echo "add-to-moses.sh: could not hook the CSLM buffer into $cube (a Moses version this script does not know?)" >&2; exit 1; }
  mv "$cube.cslm.tmp" "$cube"
fi
if ! grep -q 'CSLMBuffer' "$cubesearch"; then
  perl -0p -e '
    s{(#include "SearchCubePruning.h"\n)}{$1#include "moses/FF/CSLMBuffer.h"\n};
    s{(\n)(\s*)(for\(bmIter = accessor.begin\(\); bmIter != accessor.end\(\); \+\+bmIter\) \{\n\s*// build the first hypotheses)}{$1$2CSLMBuffer::Flush();  // the CSLM buffer: score the cubes built so far\n$2$3};
  ' "$cubesearch" > "$cubesearch.cslm.tmp"
  [ "$(grep -c 'CSLMBuffer' "$cubesearch.cslm.tmp")" = 2 ] \
    || { rm -f "$cubesearch.cslm.tmp"; echo "add-to-moses.sh: could not hook the CSLM buffer into $cubesearch (a Moses version this script does not know?)" >&2; exit 1; }
  mv "$cubesearch.cslm.tmp" "$cubesearch"
fi
echo "CSLM added to $moses; now rebuild Moses (e.g. ./bjam -j4 in $moses)"
