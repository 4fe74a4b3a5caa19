#!/bin/sh
# Compose mounts file secrets with the host file's owner and mode (0644 after a git
# checkout), and the worker refuses a key file that others may read. So, as root, copy each
# secret into a private tmpfs as an owner-only file of the unprivileged `aip` user, then
# drop to that user for the real command.
set -eu
umask 077
mkdir -p /run/aip
if [ -d /run/secrets ]; then
  for secret in /run/secrets/*; do
    [ -f "$secret" ] || continue
    target="/run/aip/$(basename "$secret")"
    cp "$secret" "$target"
    chown aip:aip "$target"
    chmod 0600 "$target"
  done
fi
chown aip:aip /run/aip
exec setpriv --reuid=aip --regid=aip --init-groups -- "$@"
