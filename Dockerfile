# usage-ledger gateway: `ledger serve` by default, as a non-root user, with a health check.
# Build:  docker build -t usage-ledger .
# Run:    docker run -p 8300:8300 -e LEDGER_UPSTREAM=http://vllm:8200 \
#           -v ledger-data:/data -v ledger-state:/var/lib/ledger usage-ledger
# /data holds the SQLite ledger; /var/lib/ledger the gateway's own state: its outage spool and its
# fingerprint key (a secret, created there on first start unless LEDGER_FINGERPRINT_KEY_FILE names one).
# A bind-mounted host directory must be writable by uid 10001: `chown 10001:10001 DIR` on the host, or run
# as its owner (`--user "$(stat -c %u:%g DIR)"`); the entrypoint refuses, saying so, otherwise.
# Every version installed is pinned by docker/constraints.txt (`make constraints` regenerates it);
# the `otel` and `parquet` extras are in (LEDGER_OTEL_EXPORT=1, `ledger export --format parquet`).
FROM python:3.11-slim AS build
WORKDIR /src
COPY docker/constraints.txt ./constraints.txt
COPY pyproject.toml README.md LICENSE ./
COPY usage_ledger ./usage_ledger
RUN pip wheel --no-cache-dir --wheel-dir /wheels --constraint constraints.txt ".[otel,parquet]"

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 --user-group ledger \
    && mkdir -p /data /var/lib/ledger /var/lib/ledger-key \
    && chown 10001:10001 /data /var/lib/ledger /var/lib/ledger-key
COPY --from=build /wheels /wheels
COPY --from=build /src/constraints.txt /tmp/constraints.txt
COPY docker/entrypoint.sh /usr/local/bin/ledger-entrypoint
RUN pip install --no-cache-dir --no-index --find-links /wheels --constraint /tmp/constraints.txt \
        "usage-ledger[otel,parquet]" \
    && rm -rf /wheels /tmp/constraints.txt
USER 10001:10001
WORKDIR /home/ledger
ENV LEDGER_HOST=0.0.0.0 \
    LEDGER_PORT=8300 \
    LEDGER_DATABASE_URL=sqlite:////data/ledger.db \
    LEDGER_STATE_DIR=/var/lib/ledger \
    LEDGER_LOG_FORMAT=json
VOLUME ["/data", "/var/lib/ledger"]
EXPOSE 8300
# The port the gateway listens on is LEDGER_PORT's (set it, not `serve --port`, to move it): the check follows it.
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; sys.exit(urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\"LEDGER_PORT\"]}/_ledger/health', timeout=2).status != 200)"]
# Says what to do, and stops, when a bind-mounted /data or state directory is not writable by uid 10001.
ENTRYPOINT ["/bin/sh", "/usr/local/bin/ledger-entrypoint"]
CMD ["sh", "-c", "ledger db upgrade && exec ledger serve"]
