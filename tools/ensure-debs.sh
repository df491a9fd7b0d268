#!/usr/bin/env bash
# Installs the Debian packages the tests and the demo need, only when missing.
# Debian 12 (bookworm) package names; run as root (CI and the appliance build are).
set -euo pipefail
packages=(
  libsrt1.5-openssl libsrt-openssl-dev srt-tools   # SRT: the library we bind and its reference peer
  ffmpeg                                             # test streams, ffprobe, prompeg FEC peer
  gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad
  gstreamer1.0-plugins-ugly gstreamer1.0-libav gstreamer1.0-x  # x264enc, avenc_aac, timeoverlay: the RTSP test camera
  gir1.2-gst-rtsp-server-1.0 gir1.2-gstreamer-1.0 gir1.2-gst-plugins-base-1.0 python3-gi  # gst-rtsp-server from python3-gi
  chromium                                           # the setup wizard test (driven by playwright)
  tmux                                               # drives `mp stats --watch` in a real terminal
  iproute2                                           # network namespaces for multicast tests
  nftables                                           # loss and blocks on a test netns's veth (the kernel has no netem)
  tshark                                             # a second opinion on TS continuity errors
  socat wrk                                          # benchmark peers and load
  stunnel4                                           # TLS in front of FFmpeg's RTMP listener (RTMPS output test)
  postgresql                                         # the manager's store tests run on a real PostgreSQL too
  haproxy                                            # two mp-manager instances behind a load balancer (the fleet e2e)
  prometheus                                         # for promtool only: /metrics lint, alert rules (server kept off)
  mandoc                                             # lints the generated man pages as the image's viewer reads them
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "ensure-debs: installing ${missing[*]}" >&2
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
# No package starts a service while we install (prometheus's server, postgresql's cluster,
# haproxy: the tests run their own): a policy-rc.d that denies starts, for this run, unless the system has one.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# tools/ensure-debs.sh: no service starts during its install\nexit 101\n' |
    "${sudo_cmd[@]}" tee "$policy" >/dev/null
  "${sudo_cmd[@]}" chmod 755 "$policy"
  trap '"${sudo_cmd[@]}" rm -f "$policy"' EXIT
fi
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# We only want promtool from it: keep the Prometheus server from starting at the next boot too.
if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null; then
  "${sudo_cmd[@]}" systemctl disable prometheus.service >/dev/null 2>&1 || true
fi
