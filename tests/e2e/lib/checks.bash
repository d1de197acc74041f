# Sourced by the end-to-end scripts (tests/e2e/*.sh): counters of passed and failed checks, and the helpers that
# update them. A script ends with `echo "NAME: $passed passed, $failed failed"` and `[[ $failed -eq 0 ]]`.
#   ok                    one more check passed
#   bad WHAT              one more check failed, named on stderr
#   check WHAT CMD ARGS   runs CMD ARGS: ok if it succeeds, else bad WHAT
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }
check() { local what=$1; shift; if "$@"; then ok; else bad "$what"; fi; }
