# testlib.sh — what the tests/cli_*.sh scripts share: pass/fail counters with
# ok/bad, a temporary directory $T removed on exit, and the closing summary
# whose status is the script's. Source it after cd "$REPO":
#   . tests/testlib.sh; cli_tmpdir cli_NAME; ...; cli_finish cli_NAME
# (not named cli_*.sh: tests/CMakeLists.txt runs every cli_*.sh as a test)
fail=0; pass=0
ok()  { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*" >&2; }
# T=$(mktemp -d /tmp/ekv_NAME.XXXXXX), removed on exit; a script with more to
# clean up sets its own trap afterwards
cli_tmpdir() { T=$(mktemp -d "/tmp/ekv_$1.XXXXXX"); trap 'rm -rf "$T"' EXIT; }
cli_finish() { echo "$1: $pass passed, $fail failed"; [ "$fail" -eq 0 ]; }
