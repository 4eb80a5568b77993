#!/usr/bin/env bash
# tools/gpu_debs.sh -- fetch what tools/gpu_check.sh unpacks on a GPU machine that has no LuaJIT,
# busted or image libraries (and no package registry): Debian's .deb files, into .dev/debs (a
# folder git ignores through .git/info/exclude; name it in the device tool's `carry`).
#   bash tools/gpu_debs.sh        # on this (Debian 12) machine, before the device call
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >> .git/info/exclude
mkdir -p .dev/debs
cd .dev/debs
# LuaJIT and busted with busted's Lua dependencies (as Debian 12 lists them); the image libraries
# liblumen.so links (-ljpeg -lpng -lz) with their headers for the build there
apt-get download luajit libluajit-5.1-2 libluajit-5.1-common lua-busted lua-cliargs lua-dkjson \
   lua-filesystem lua-luassert lua-mediator lua-penlight lua-say lua-system lua-term \
   libjpeg62-turbo libjpeg62-turbo-dev libpng16-16 libpng-dev zlib1g zlib1g-dev
ls -la
du -sh .
