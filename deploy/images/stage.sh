#!/usr/bin/env bash
# Lays out the build context of one image: rootfs/ with the binary at /usr/local/bin/<name>, the passwd/group
# entries of the non-root user 65532, the CA bundle (AWS endpoints are reached over TLS) and, for a dynamically
# linked binary, the shared libraries it loads (as ldd resolves them here, Debian packages) with the loader.
#
#   stage.sh BINARY CONTEXT_DIR
set -euo pipefail

binary=$1
context=$2
name=$(basename "$binary")
[ -x "$binary" ] || { echo "stage.sh: $binary is not an executable (build it first)" >&2; exit 1; }

rm -rf "$context"
rootfs=$context/rootfs
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"
install -m 0755 "$binary" "$rootfs/usr/local/bin/$name"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/tmp:/sbin/nologin\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$rootfs/etc/group"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
fi

# ldd prints "not a dynamic executable" (exit 1) or "statically linked" for static binaries.
if libs=$(ldd "$binary" 2>/dev/null) && ! grep -q 'statically linked' <<<"$libs"; then
  # Lines are "libx.so.1 => /path/libx.so.1 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)".
  grep -q 'not found' <<<"$libs" && { echo "stage.sh: unresolved libraries of $binary:" >&2; echo "$libs" >&2; exit 1; }
  for lib in $(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$libs"); do
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
  done
  echo "staged $name (dynamic, $(awk '$2 == "=>"' <<<"$libs" | wc -l) shared libraries) in $context"
else
  echo "staged $name (static) in $context"
fi
