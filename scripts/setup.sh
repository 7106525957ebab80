#!/bin/sh
# Installs what ekv needs to build, test and plot, from Debian's packages only.
# Safe to run again: packages already present are skipped.
set -eu
PKGS="build-essential cmake pkg-config libcjson-dev libstb-dev libmicrohttpd-dev gnuplot-nox"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "ekv setup: installing$missing" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
