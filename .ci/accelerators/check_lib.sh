# Shared by .ci/accelerators/gpu_check.sh and .ci/accelerators/tpu_check.sh, sourced once they set `root`,
# `out`, `dist`, `check_name`, `python`, `budget`, `test_s` and `stacks_s` (and, if it
# wants no junit files, `junit=no`: a machine that returns few files): the summary
# file and its lines (`say`, `result`), the time left (`left`, `cap`), `install_step` (the
# wheels from `dist` onto PYTHONPATH), and `pytest_step`, one pytest run that survives a
# hung test.
#
# Every step writes a verbose log as it goes (a test's name appears when it starts, its
# outcome when it ends, so a run cut off still names each outcome), a junit file (unless
# junit=no), and
# NAME.failures.txt: each failure's report as it happens (.ci/accelerators/pytest_live_failures.py),
# so that a run killed later keeps the reasons.

mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
start=$SECONDS
say() { echo "[$check_name $((SECONDS - start))s] $*" | tee -a "$summary"; }
result() {  # result STATUS TEXT: the last line, and the exit
    echo "RESULT: $2" | tee -a "$summary"
    exit "$1"
}
left() { echo $((budget - (SECONDS - start))); }
cap() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }  # min(step, left)

# install_step before|after: the wheel in $dist and only the test tools the machine lacks,
# unpacked into a folder of their own (not under $OUT: only results go back; removed at
# exit), put on PYTHONPATH before or after what is there already ("after": the machine's
# own packages, its JAX among them, stay the ones imported). A failure ends the check.
install_step() {
    work=$(mktemp -d "${TMPDIR:-/tmp}/hostfeed_${check_name}.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    local site="$work/site"
    if ! "$python" "$root/.ci/accelerators/check_install.py" "$dist" "$site" > "$out/install.log" 2>&1; then
        tail -5 "$out/install.log" | tee -a "$summary"
        result 2 "setup failed: hostfeed or the test tools cannot be installed (install.log)"
    fi
    say "install: $(grep -c '^unpacked' "$out/install.log") wheel(s) unpacked onto PYTHONPATH (install.log)"
    if [ "$1" = after ]; then
        export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$site"
    else
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
}

# pytest_step NAME SECONDS ARGS...: one pytest run, verbose log and junit under $OUT. A
# test hung past GPU_CHECK_TEST_S ends the process (pytest-timeout's thread method): the
# step then resumes with the tests not yet started (every test that started is deselected),
# up to 3 times, while its time lasts; the junit file then covers the last part only.
pytest_step() {
    local name=$1 secs=$2
    shift 2
    local log="$out/$name.log" until=$((SECONDS + secs)) rc=0 part=0 hung=0 t
    local deselect=() junit_args=()
    [ "${junit:-yes}" = no ] || junit_args=(--junitxml="$out/$name.xml")
    : > "$log"
    : > "$out/$name.failures.txt"
    while :; do
        local remaining=$((until - SECONDS))
        if [ "$remaining" -lt 10 ]; then
            if [ "$part" -eq 0 ]; then
                say "$name: no time left (${remaining} s)"
                echo "(not run: no time left)" >> "$log"
                return 124
            fi
            say "$name: no time left to resume after the hung test"
            break
        fi
        part=$((part + 1))
        [ "$part" -gt 1 ] && echo "==== part $part: resumed after a hung test, ${#deselect[@]} arguments deselecting what ran ====" >> "$log"
        local first_line=$(($(wc -l < "$log") + 1))
        # SIGINT first: pytest then reports what ran and writes its junit file.
        PYTHONPATH="$root/.ci/accelerators${PYTHONPATH:+:$PYTHONPATH}" LIVE_FAILURES="$out/$name.failures.txt" \
        timeout -s INT -k 15 "$remaining" "$python" -m pytest -p pytest_timeout -p no:cacheprovider \
            -p pytest_live_failures \
            -o addopts="" -o faulthandler_timeout="$stacks_s" --timeout="$test_s" \
            --timeout-method=thread -v -rA --durations=20 "${junit_args[@]}" \
            "${deselect[@]}" "$@" >> "$log" 2>&1
        rc=$?
        # A hung test (pytest-timeout ends the process), or a process that died of a signal
        # (a crash, or one while a hung test's stacks were dumped): resume after it.
        if [ "$rc" -ne 124 ] && { [ "$rc" -ge 128 ] || tail -n +"$first_line" "$log" \
                | grep -q -E "Timeout \+|Fatal Python error"; }; then
            hung=$((hung + 1))
            say "$name: a test hung or crashed the process (exit status $rc): $(grep -oE '^[^ ]+::[^ ]+' "$log" | tail -1) (stacks in $name.log)"
            if [ "$part" -le 3 ]; then
                deselect=()
                while read -r t; do deselect+=(--deselect "$t"); done \
                    < <(grep -oE '^[^ ]+::[^ ]+' "$log" | sort -u)
                continue
            fi
        fi
        break
    done
    [ "$hung" -gt 0 ] && [ "$rc" -eq 0 ] && rc=1  # a hang is a failure
    local passed failed
    passed=$(grep -cE ' PASSED( |$)' "$log")
    failed=$(grep -cE ' (FAILED|ERROR)( |$)' "$log")
    grep -E '^(FAILED|ERROR) tests/' "$log" | head -30 | tee -a "$summary"
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] \
        && say "$name: ran out of its ${secs} s (partial: $name.log names each test that ran)"
    say "$name: exit status $rc; $passed passed, $failed failed or errored, $hung hung; $(tail -1 "$log" | cut -c1-160)"
    return "$rc"
}

# suite_step TITLE [PYTEST_ARGS...]: the suite (the files of `suite_files`, by default
# those .ci/accelerators/suite_files.py lists: the device path's first, never the wholly
# host-side ones), in the time left, then the total; returns pytest_step's.
suite_step() {
    local title=$1 secs=$(( $(left) - 5 )) rc files
    shift
    say "$title (at most ${secs} s)"
    files=${suite_files:-$("$python" "$root/.ci/accelerators/suite_files.py")} || return 1
    # shellcheck disable=SC2086 # a list of paths
    pytest_step suite "$secs" "$@" $files
    rc=$?
    say "total $((SECONDS - start)) s of ${budget} s; files in \$OUT: $(ls "$out" | wc -l)"
    return "$rc"
}
