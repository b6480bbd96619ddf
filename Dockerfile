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
RUN . scripts/env.sh && cargo build --release --locked --bin arc-rec \
 && cp target/release/arc-rec /arc-rec-trainer

FROM debian:bookworm-slim AS service
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates postgresql-client \
 && rm -rf /var/lib/apt/lists/* && useradd --system --uid 10001 arcrec
COPY --from=builder /arc-rec-service /usr/local/bin/arc-rec
USER arcrec
ENTRYPOINT ["arc-rec"]

FROM debian:bookworm-slim AS trainer
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates postgresql-client libgomp1 \
 && rm -rf /var/lib/apt/lists/* && useradd --system --uid 10001 arcrec
# The binary's rpath points at the builder's venv path, so libtorch goes to the same place.
COPY --from=builder /src/.venv/lib/python3.11/site-packages/torch/lib /src/.venv/lib/python3.11/site-packages/torch/lib
COPY --from=builder /src/.venv/lib/python3.11/site-packages/nvidia /src/.venv/lib/python3.11/site-packages/nvidia
COPY --from=builder /arc-rec-trainer /usr/local/bin/arc-rec
USER arcrec
ENTRYPOINT ["arc-rec"]
