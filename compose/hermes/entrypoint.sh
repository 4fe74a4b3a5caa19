#!/bin/sh
# The Hermes image's entrypoint: as root, render HERMES_HOME from the mounted config template
# and the secret files (hermes-render-home: render_home.py), hand the data directory to the
# unprivileged `hermes` user, and run the command (the gateway) as that user. Only coreutils
# and setpriv are used: a minimal base image has no grep, sed or awk.
set -eu
hermes-render-home
# The terminal tool's working directory (`terminal.cwd` of the shipped config).
mkdir -p /var/lib/hermes/work
# A pid file left by this container's previous life: one gateway runs per container, so it
# is stale, and a reused pid could make the new gateway think it is already running.
rm -f "$HERMES_HOME/gateway.pid"
chown -R hermes:hermes /var/lib/hermes
exec setpriv --reuid=hermes --regid=hermes --init-groups -- "$@"
