# Sourced by the end-to-end scripts (tests/e2e/*.sh): counters of passed and failed checks, and the helpers that
# update them. A script ends with `echo "NAME: $passed passed, $failed failed"` and `[[ $failed -eq 0 ]]`.
#   ok                    one more check passed
#   bad WHAT              one more check failed, named on stderr
#   check WHAT CMD ARGS   runs CMD ARGS: ok if it succeeds, else bad WHAT
#   check_all WHAT CMD ARGS ::: CMD ARGS ...   one check of several commands: ok if every one succeeds (not
#                         `check WHAT A && B`: there B runs outside the check, and its failure went uncounted)
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }
check() { local what=$1; shift; if "$@"; then ok; else bad "$what"; fi; }
check_all() {
    local what=$1 arg all=1
    shift
    local cmd=()
    for arg in "$@" :::; do
        if [[ $arg == ::: ]]; then
            [[ ${#cmd[@]} -eq 0 ]] || "${cmd[@]}" || all=0
            cmd=()
        else
            cmd+=("$arg")
        fi
    done
    if [[ $all -eq 1 ]]; then ok; else bad "$what"; fi
}
