#!/bin/sh
# Makes sure the Debian packages parc needs are installed.  As root it
# installs what is missing; otherwise it prints the apt-get line and stops.
set -eu
PKGS="gcc make cmake flex bison clang libclang-rt-14-dev llvm-14-dev libopenblas-dev
      libcjson-dev python3 python3-torch libopenmpi-dev openmpi-bin"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
  echo "setup: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends $missing >/dev/null
else
  echo "setup: parc needs these Debian packages:$missing"
  echo "run:   sudo apt-get install -y$missing"
  exit 1
fi
