#!/usr/bin/env bash
# make test's pytest run, in two parts that run side by side:
#
# - the tests that make network namespaces (marker `netns`: veth pairs, addresses, links up
#   and down) run in one pytest process inside a network namespace of their own
#   (`unshare --net`, its loopback up);
# - everything else runs as before: three xdist workers, one test file each at a time.
#
# Why: Chromium watches the addresses and links of its network namespace over rtnetlink
# (net/base/address_tracker_linux.cc) and, on any change, fails the requests in flight with
# net::ERR_NETWORK_CHANGED. A veth made by a netns test beside a browser test failed CI twice
# (a page load, a fetch). In a namespace of their own the netns tests' links are invisible to
# the browsers; tests/e2e/test_netns_isolation.py checks it from the other side.
#
# Without root or without `unshare` (a developer's machine), one run as before: the netns
# tests skip there without root anyway.
set -u -o pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
COMMON=(-q -p no:cacheprovider)
MAIN=(-n 3 --dist loadfile --durations=40)

if [ "$(id -u)" != 0 ] || ! unshare --net true 2>/dev/null; then
    exec "$PY" -m pytest "${COMMON[@]}" "${MAIN[@]}" "$@"
fi

mkdir -p build
log=build/test-netns.log
# The namespace the browser tests run in (this shell's): the isolation test watches it.
# shellcheck disable=SC2016  # $0 and $@ are the inner shell's
MP_TEST_SHARED_NETNS=/proc/$$/ns/net unshare --net -- bash -c 'ip link set lo up && exec "$0" -m pytest "$@"' \
    "$PY" "${COMMON[@]}" -m netns --durations=10 "$@" >"$log" 2>&1 &
netns_pid=$!

"$PY" -m pytest "${COMMON[@]}" "${MAIN[@]}" -m "not netns" "$@"
main_rc=$?
wait "$netns_pid"
netns_rc=$?

echo
echo "== the netns tests, run in a network namespace of their own (log: $log):"
cat "$log"
echo
echo "make test: main run exit $main_rc, netns run exit $netns_rc"
# pytest's 5 is "nothing collected": a selection (make test ARGS...) may leave one part empty.
[ "$main_rc" = 0 ] || [ "$main_rc" = 5 ] || exit "$main_rc"
[ "$netns_rc" = 0 ] || [ "$netns_rc" = 5 ] || exit "$netns_rc"
[ "$main_rc" = 0 ] || [ "$netns_rc" = 0 ] || exit 5
