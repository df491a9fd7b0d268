#!/usr/bin/env bash
# Installs what `make image` and `make image-test` need on a Debian 12 host, only when missing:
# mkosi 24 from bookworm-backports (bookworm's mkosi 14 cannot build a bootable image here),
# qemu (TCG boot test) and OVMF (UEFI firmware for the systemd-boot disk).
# Only mkosi and what it pulls (systemd 254) come from backports; `-t bookworm-backports` for
# everything would upgrade unrelated packages (it broke curl in a trial).
set -euo pipefail

need=()
mkosi_major=$(mkosi --version 2>/dev/null | awk '{print int($2)}' || true)
if [ "${mkosi_major:-0}" -lt 24 ]; then need+=("mkosi/bookworm-backports"); fi
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
test -f /usr/share/OVMF/OVMF_CODE_4M.fd || need+=(ovmf)
command -v openssl >/dev/null || need+=(openssl)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi

if [ "$(id -u)" -ne 0 ]; then
    echo "image: missing ${need[*]}; run as root (or apt-get install them) and retry" >&2
    exit 1
fi
if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    cat > /etc/apt/sources.list.d/bookworm-backports.sources <<'SOURCES'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
fi
echo "image: installing ${need[*]}" >&2
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
