#!/usr/bin/env bash
# Build an NLTK_DATA folder with real WordNet 3.0 (for METEOR) from Debian's packages,
# without nltk.download: apt's wordnet-base + wordnet-sense-index, plus the `lexnames`
# file that Debian leaves out (written here from the list in its lexnames(5WN) page).
#
#   scripts/install_wordnet.sh [DEST]     # DEST default: $NLTK_DATA (first entry), else ~/.cache/memlab/nltk_data
#
# memlab finds the result through NLTK_DATA or its default cache path.
# Set MEMLAB_SKIP_APT=1 to use WordNet files already under $WORDNET_SRC (default /usr/share/wordnet).
set -euo pipefail

NLTK_FIRST="${NLTK_DATA:-}"; NLTK_FIRST="${NLTK_FIRST%%:*}"   # the first entry of a colon-separated NLTK_DATA
DEST="${1:-${NLTK_FIRST:-$HOME/.cache/memlab/nltk_data}}"
SRC="${WORDNET_SRC:-/usr/share/wordnet}"
FILES="adj.exc adv.exc noun.exc verb.exc cntlist.rev data.adj data.adv data.noun data.verb
       index.adj index.adv index.noun index.verb index.sense"

missing() { for f in $FILES; do [ -f "$SRC/$f" ] || return 0; done; return 1; }

if missing && [ "${MEMLAB_SKIP_APT:-0}" != "1" ]; then
    SUDO=""
    if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
    echo "install_wordnet: installing wordnet-base and wordnet-sense-index with apt-get" >&2
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends wordnet-base wordnet-sense-index
fi
if missing; then
    echo "install_wordnet: WordNet 3.0 files not found under $SRC" >&2
    exit 1
fi

OUT="$DEST/corpora/wordnet"
mkdir -p "$OUT"
for f in $FILES; do cp "$SRC/$f" "$OUT/$f"; done

# lexnames(5WN): "two digit file number <TAB> lexicographer file name <TAB> syntactic category"
# (1 noun, 2 verb, 3 adjective, 4 adverb).
i=0
: > "$OUT/lexnames"
for entry in adj.all:3 adj.pert:3 adv.all:4 noun.Tops:1 noun.act:1 noun.animal:1 noun.artifact:1 \
    noun.attribute:1 noun.body:1 noun.cognition:1 noun.communication:1 noun.event:1 noun.feeling:1 \
    noun.food:1 noun.group:1 noun.location:1 noun.motive:1 noun.object:1 noun.person:1 \
    noun.phenomenon:1 noun.plant:1 noun.possession:1 noun.process:1 noun.quantity:1 noun.relation:1 \
    noun.shape:1 noun.state:1 noun.substance:1 noun.time:1 verb.body:2 verb.change:2 \
    verb.cognition:2 verb.communication:2 verb.competition:2 verb.consumption:2 verb.contact:2 \
    verb.creation:2 verb.emotion:2 verb.motion:2 verb.perception:2 verb.possession:2 verb.social:2 \
    verb.stative:2 verb.weather:2 adj.ppl:3; do
    printf '%02d\t%s\t%s\n' "$i" "${entry%%:*}" "${entry##*:}" >> "$OUT/lexnames"
    i=$((i + 1))
done
[ "$i" = "45" ] || { echo "install_wordnet: expected 45 lexicographer files, wrote $i" >&2; exit 1; }

echo "install_wordnet: WordNet 3.0 ready in $OUT (export NLTK_DATA=$DEST)"
