#!/bin/sh
# The image's entrypoint: refuse to start, saying what to do, when the directories the ledger writes are not
# writable by this user (a bind-mounted host directory keeps its host owner; the image runs as uid 10001),
# then run the command. A named volume is created with the image's ownership and always passes.
set -eu

check_writable() {
    [ -d "$1" ] || return 0  # created by the command itself where its parent allows
    if [ ! -w "$1" ]; then
        uid=$(id -u)
        gid=$(id -g)
        echo "ledger: error: $1 ($2) is not writable by uid $uid (the image's user): it is probably a" \
            "bind-mounted host directory owned by $(stat -c %u:%g "$1"). Either give it to that user on the" \
            "host (chown $uid:$gid DIR), or run the container as the directory's owner" \
            "(docker run --user \"\$(stat -c %u:%g DIR)\" ...; compose: user: \"UID:GID\")." >&2
        exit 2
    fi
}

case "${LEDGER_DATABASE_URL:-}" in
    sqlite:///*) check_writable "$(dirname "${LEDGER_DATABASE_URL#sqlite:///}")" LEDGER_DATABASE_URL ;;
esac
if [ -n "${LEDGER_STATE_DIR:-}" ]; then
    check_writable "$LEDGER_STATE_DIR" LEDGER_STATE_DIR
fi
exec "$@"
