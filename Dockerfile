# syntax=docker/dockerfile:1
# Two images from one build:
#   docker build --target service -t arc-rec .   # slim service, no libtorch (--no-default-features)
#   docker build --target trainer -t arc-rec-trainer .   # with libtorch (torch==2.11.0 from PyPI)
# Both expect DATABASE_URL (the embedded cluster is for development machines).

FROM rust:1.95-bookworm AS builder
RUN apt-get update && apt-get install -y --no-install-recommends python3-venv && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY scripts/setup.sh scripts/env.sh scripts/
RUN python3 -m venv .venv && .venv/bin/pip install --no-cache-dir torch==2.11.0
COPY . .
RUN cargo build --release --locked --no-default-features --bin arc-rec \
 && cp target/release/arc-rec /arc-rec-service
# scripts/env.sh is bash (it finds the project from BASH_SOURCE); under the default sh it pointed
# PATH at /.venv and tch's build script found no python.
SHELL ["/bin/bash", "-c"]
RUN source scripts/env.sh && cargo build --release --locked --bin arc-rec \
 && cp target/release/arc-rec /arc-rec-trainer

FROM debian:bookworm-slim AS service
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates postgresql-client \
 && rm -rf /var/lib/apt/lists/* && useradd --system --uid 10001 arcrec
COPY --from=builder /arc-rec-service /usr/local/bin/arc-rec
USER arcrec
# In a container the service listens on every interface (outside one, 127.0.0.1 by default).
ENV ARC_REC_LISTEN=0.0.0.0:8080
EXPOSE 8080
# Healthy when /readyz answers 200 (the database answers and has every migration), on the port
# of ARC_REC_LISTEN; bash's /dev/tcp, as the slim image has no curl.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${ARC_REC_LISTEN##*:} && printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["arc-rec"]
CMD ["serve"]

FROM debian:bookworm-slim AS trainer
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates postgresql-client libgomp1 \
 && rm -rf /var/lib/apt/lists/* && useradd --system --uid 10001 arcrec
# The binary's rpath points at the builder's venv path, so libtorch goes to the same place.
COPY --from=builder /src/.venv/lib/python3.11/site-packages/torch/lib /src/.venv/lib/python3.11/site-packages/torch/lib
COPY --from=builder /src/.venv/lib/python3.11/site-packages/nvidia /src/.venv/lib/python3.11/site-packages/nvidia
COPY --from=builder /arc-rec-trainer /usr/local/bin/arc-rec
USER arcrec
ENTRYPOINT ["arc-rec"]
