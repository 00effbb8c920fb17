# test_lib.sh: sourced by apex-train's shell tests (test_cli.sh, test_features.sh, test_signals.sh,
# test_distributed.sh) with the apex-train binary as its argument: `. "$(dirname "$0")/test_lib.sh" "$1"`.
# Sets BIN (that binary, absolute), SRC (tools/apex_train) and W (a fresh work directory, removed on
# exit, made the current directory), and the helpers the tests share: ok/ko count results in $fails,
# snapshot/bad check refusals, finish ends the test with its status.
set -uo pipefail
BIN=$(realpath "$1")
SRC=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
fails=0
ok() { echo "ok   $*"; }
ko() { echo "FAIL $*"; fails=$((fails + 1)); }

# A listing (names, sizes, contents) of the work directory, to see that nothing changed; ./snap is
# where a test keeps copies of its own to compare against, so it is left out.
snapshot() { find . -path ./snap -prune -o -type f -print0 | sort -z | xargs -0 -r sha256sum; find . -path ./snap -prune -o -print | sort; }

# bad NAME ARGS...: apex-train ARGS is refused with one line on stderr (kept in LAST_ERR, the exit
# status in LAST_RC), nothing written or changed under $W.
bad() {
  local name=$1
  shift
  local before after rc lines
  before=$(snapshot)
  "$BIN" "$@" > /dev/null 2> "$W/../err.$$"
  rc=$?
  lines=$(wc -l < "$W/../err.$$")
  LAST_ERR=$(cat "$W/../err.$$")
  LAST_RC=$rc
  after=$(snapshot)
  if [ $rc -eq 0 ]; then
    ko "$name: exit 0 for: $*"
  elif [ "$lines" -ne 1 ]; then
    ko "$name: $lines lines on stderr:"; cat "$W/../err.$$"
  elif [ "$before" != "$after" ]; then
    ko "$name: files changed:"; diff <(echo "$before") <(echo "$after") | head
  else
    ok "$name (exit $rc): $(cat "$W/../err.$$")"
  fi
  rm -f "$W/../err.$$"
}

# bad_run NAME COMMAND...: refused with one apex-train line on stderr (mpirun adds its own lines about
# the exit status), a non-zero exit, nothing written or changed under $W. Unlike bad,
# COMMAND is a whole command line (mpirun or apex-train), and only apex-train's lines count. Sets
# LAST_ERR to them.
bad_run() {
  local name=$1
  shift
  local before after rc lines
  before=$(snapshot)
  "$@" > "$W/../out.$$" 2> "$W/../err.$$"
  rc=$?
  lines=$(grep -c '^apex-train:' "$W/../err.$$")
  LAST_ERR=$(grep '^apex-train:' "$W/../err.$$")
  after=$(snapshot)
  if [ $rc -eq 0 ]; then
    ko "$name: exit 0 for: $*"
  elif [ "$lines" -ne 1 ] || grep -q '^apex-train:' "$W/../out.$$"; then
    ko "$name: $lines apex-train lines on stderr:"; cat "$W/../err.$$" "$W/../out.$$"
  elif [ "$before" != "$after" ]; then
    ko "$name: files changed:"; diff <(echo "$before") <(echo "$after") | head
  else
    ok "$name (exit $rc): $(grep '^apex-train:' "$W/../err.$$")"
  fi
  rm -f "$W/../err.$$" "$W/../out.$$"
}

# skip REASON: the parts that need something absent are skipped; exit 77 (ctest's SKIP) when every
# check so far passed, 1 otherwise.
skip() {
  echo "skipped: $*"
  [ $fails -eq 0 ] && exit 77
  exit 1
}

# from_step FROM TO N: TO becomes a checkpoint directory whose latest is a copy of FROM/step-N, as if a
# run of FROM's flags had stopped after N steps (a run with a smaller --steps has another lr schedule).
from_step() { mkdir -p "$2" && cp -r "$1/step-$3" "$2/" && printf 'step-%s\n' "$3" > "$2/latest"; }
# log_until LOG N: the lines of LOG up to step N (evaluations included).
log_until() { awk -v n="$2" '{ s = $0; sub(/^\{"step":/, "", s); if (s + 0 > n) exit; print }' "$1"; }

# finish: the count of failures, and the test's exit status.
finish() {
  echo "$fails failures"
  [ $fails -eq 0 ]
}
