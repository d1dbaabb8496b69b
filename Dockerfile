# usage-ledger gateway: `ledger serve` by default, as a non-root user, with a health check.
# Build:  docker build -t usage-ledger .
# Run:    docker run -p 8300:8300 -e LEDGER_UPSTREAM=http://vllm:8200 -v ledger-data:/data usage-ledger
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY usage_ledger ./usage_ledger
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 --user-group ledger \
    && mkdir /data \
    && chown 10001:10001 /data
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels
USER 10001:10001
WORKDIR /home/ledger
ENV LEDGER_HOST=0.0.0.0 \
    LEDGER_PORT=8300 \
    LEDGER_DATABASE_URL=sqlite:////data/ledger.db \
    LEDGER_SPOOL_DIR=/data/spool \
    LEDGER_LOG_FORMAT=json
VOLUME ["/data"]
EXPOSE 8300
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8300/_ledger/health', timeout=2).status != 200)"]
CMD ["sh", "-c", "ledger db upgrade && exec ledger serve"]
