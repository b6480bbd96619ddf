#!/usr/bin/env bash
# Builds the Dockerfile's two images with podman and runs them against a Postgres container
# (issue: reliability, containers): `arc-rec migrate`, `simulate` and `serve` from the service
# image, `/readyz` and one `/v1/recommendations` answer through the container's port, the
# image's health check, and `model init` (libtorch) from the trainer image. Prints the image
# sizes and PASS or FAIL.
#
#     scripts/container-test.sh
#
# On machines without a registry (these: no Docker Hub), the base images the Dockerfile names
# are made here when `podman image exists` says they are missing, as
# ../shared/research/containers-here.md found works: `debian:bookworm-slim` from Debian's
# packages (debootstrap), `rust:1.95-bookworm` from that plus this machine's Rust 1.95 toolchain,
# and a stand-in for `postgres:16` (Debian's PostgreSQL 15 with the official image's
# POSTGRES_PASSWORD convention). The Dockerfile itself is unchanged. podman runs with runc (crun
# refuses this kernel's hybrid cgroups), host networking and ulimits no higher than the current
# ones. Needs root (debootstrap, podman). Build time: two release builds of arc-rec in the
# builder stage plus torch==2.11.0 from PyPI; an hour on 2 cores.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
state="${ARC_REC_CONTAINER_STATE:-/var/tmp/arc-rec-containers}"
mkdir -p "$state"
podman_() { podman --runtime runc "$@"; }
limits=(--ulimit nofile=20000:20000 --ulimit nproc=4096:4096)
port=18080
pg_port=55432

for tool in podman runc debootstrap; do
  command -v "$tool" > /dev/null || {
    apt-get update -qq && apt-get install -y -qq podman runc debootstrap > /dev/null
    break
  }
done

# --- base images, made only when missing ---------------------------------------------------
if ! podman image exists docker.io/library/debian:bookworm-slim; then
  echo "== making debian:bookworm-slim with debootstrap"
  mirror="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2> /dev/null || true)"
  rm -rf "$state/rootfs"
  debootstrap --variant=minbase bookworm "$state/rootfs" "${mirror:-http://deb.debian.org/debian}" \
    > "$state/debootstrap.log"
  tar -C "$state/rootfs" -c . | podman import - docker.io/library/debian:bookworm-slim > /dev/null
  rm -rf "$state/rootfs"
fi
if ! podman image exists docker.io/library/rust:1.95-bookworm; then
  echo "== making rust:1.95-bookworm from this machine's toolchain"
  context="$state/rust-context"
  rm -rf "$context" && mkdir -p "$context/rustup/toolchains" "$context/cargo/bin"
  toolchain="$(rustup +1.95.0 show active-toolchain 2> /dev/null | cut -d' ' -f1 || true)"
  cp -a "$(rustc +1.95.0 --print sysroot)/." "$context/rustup/toolchains/1.95.0-x86_64-unknown-linux-gnu/"
  {
    echo 'version = "12"'
    echo 'default_toolchain = "1.95.0-x86_64-unknown-linux-gnu"'
    echo 'profile = "minimal"'
  } > "$context/rustup/settings.toml"
  cp "$(command -v rustup)" "$context/cargo/bin/rustup"
  for proxy in cargo rustc rustdoc cargo-fmt rustfmt cargo-clippy clippy-driver; do
    ln -f "$context/cargo/bin/rustup" "$context/cargo/bin/$proxy"
  done
  cat > "$context/Containerfile" << 'EOF'
FROM docker.io/library/debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends build-essential pkg-config \
    ca-certificates curl git python3 && rm -rf /var/lib/apt/lists/*
COPY rustup /usr/local/rustup
COPY cargo /usr/local/cargo
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:$PATH
EOF
  echo "   (toolchain ${toolchain:-1.95.0})"
  podman_ build --pull=never --network host "${limits[@]}" -t docker.io/library/rust:1.95-bookworm \
    "$context" > "$state/rust-image.log"
  rm -rf "$context"
fi
if ! podman image exists arc-rec-test/postgres:16; then
  echo "== making a stand-in for postgres:16 (Debian's PostgreSQL 15)"
  context="$state/postgres-context"
  rm -rf "$context" && mkdir -p "$context"
  cat > "$context/Containerfile" << 'EOF'
FROM docker.io/library/debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/*
USER postgres
ENV PGDATA=/var/lib/postgresql/data PATH=/usr/lib/postgresql/15/bin:$PATH
CMD ["sh", "-c", "[ -s $PGDATA/PG_VERSION ] || { echo \"$POSTGRES_PASSWORD\" > /tmp/pw && initdb -U postgres --pwfile=/tmp/pw --auth=scram-sha-256 -D $PGDATA > /dev/null; } && exec postgres -D $PGDATA -c listen_addresses=127.0.0.1 -c port=${PGPORT:-5432} -c unix_socket_directories=/tmp"]
EOF
  podman_ build --pull=never --network host "${limits[@]}" -t arc-rec-test/postgres:16 "$context" \
    > "$state/postgres-image.log"
  rm -rf "$context"
fi

# --- the project's images ---------------------------------------------------------------------
# Where this machine reaches the registries through a TLS-inspecting proxy, its CA bundle (which
# the images' Debian bundle lacks) is lent to the build's RUN steps, with pip and cargo told to
# use it; nothing of it stays in the images.
build_mounts=()
host_ca="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}"
if [ -f "$host_ca" ]; then
  printf '[global]\ncert = /usr/local/share/host-ca.crt\n' > "$state/pip.conf"
  printf '[http]\ncainfo = "/usr/local/share/host-ca.crt"\n' > "$state/cargo-config.toml"
  build_mounts=(-v "$host_ca:/usr/local/share/host-ca.crt:ro" -v "$state/pip.conf:/etc/pip.conf:ro"
    -v "$state/cargo-config.toml:/usr/local/cargo/config.toml:ro")
fi
echo "== building the service and trainer images (log: $state/build-*.log)"
started=$(date +%s)
build() { # TARGET TAG
  podman_ build --pull=never --format docker --network host "${limits[@]}" "${build_mounts[@]}" \
    --target "$1" -t "$2" "$root" > "$state/build-$1.log" 2>&1 || {
    tail -20 "$state/build-$1.log"
    echo "FAIL: building the $1 image (log: $state/build-$1.log)"
    exit 1
  }
}
build service arc-rec:test
build trainer arc-rec-trainer:test
echo "   built in $(($(date +%s) - started)) s"
size() { podman image inspect --format '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1 / 1e6}'; }
echo "   arc-rec:test $(size arc-rec:test), arc-rec-trainer:test $(size arc-rec-trainer:test)"

# --- running them -------------------------------------------------------------------------------
cleanup() {
  podman_ rm -f arc-rec-test-service arc-rec-test-postgres > /dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup
failed=0
check() { # NAME PASS|FAIL DETAILS
  printf '%-24s %s  %s\n' "$1" "$2" "$3"
  [ "$2" = PASS ] || failed=1
}
podman_ run -d --name arc-rec-test-postgres --network host "${limits[@]}" \
  -e POSTGRES_PASSWORD=arc-rec -e PGPORT=$pg_port arc-rec-test/postgres:16 > /dev/null
url="postgresql://postgres:arc-rec@127.0.0.1:$pg_port/postgres"
for _ in $(seq 1 60); do
  podman_ exec arc-rec-test-postgres pg_isready -h 127.0.0.1 -p $pg_port > /dev/null 2>&1 && break
  sleep 1
done
in_service() { podman_ run --rm --network host "${limits[@]}" -e DATABASE_URL="$url" arc-rec:test "$@"; }
in_service migrate > /dev/null
in_service simulate --seed 7 --outcomes 300 --orgs acme > /dev/null 2>&1
key="$(in_service keys create --org acme --role platform --label container-test 2> /dev/null)"
podman_ run -d --name arc-rec-test-service --network host "${limits[@]}" -e DATABASE_URL="$url" \
  -e ARC_REC_LISTEN=127.0.0.1:$port arc-rec:test serve > /dev/null
ready=""
for _ in $(seq 1 60); do
  ready="$(curl -fsS "http://127.0.0.1:$port/readyz" 2> /dev/null || true)"
  [ -n "$ready" ] && break
  sleep 1
done
[ -n "$ready" ] && verdict=PASS || verdict=FAIL
check service-readyz "$verdict" "/readyz from the service container: ${ready:-no answer}"
status=$(curl -s -o "$state/answer.json" -w '%{http_code}' -H "Authorization: Bearer $key" \
  -H 'Content-Type: application/json' "http://127.0.0.1:$port/v1/recommendations" \
  -d '{"failure_context": {"failures": [{"failure_category": "timeout", "error_message": "web_search timed out after 5000 ms"}]}, "current_config": {"model": "openai/gpt-4.1", "temperature": 0.7, "tools": [{"name": "web_search"}], "retry": {"max_attempts": 1}, "timeout_s": 30}, "k": 3}')
shown=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["recommendations"]))' \
  "$state/answer.json" 2> /dev/null || echo 0)
[ "$status" = 200 ] && [ "$shown" -gt 0 ] && verdict=PASS || verdict=FAIL
check service-recommendation "$verdict" "POST /v1/recommendations: $status, $shown recommendations"
health=$(podman_ healthcheck run arc-rec-test-service > /dev/null 2>&1 && echo healthy || echo unhealthy)
[ "$health" = healthy ] && verdict=PASS || verdict=FAIL
check service-healthcheck "$verdict" "the image's HEALTHCHECK: $health"
user=$(podman_ exec arc-rec-test-service id -un 2> /dev/null || echo "?")
[ "$user" = arcrec ] && verdict=PASS || verdict=FAIL
check service-non-root "$verdict" "runs as: $user"
podman_ run --rm --network host "${limits[@]}" --tmpfs /work:rw,size=256m,mode=1777 \
  arc-rec-trainer:test model init --preset tiny --corpus-outcomes 50 --out /work/tiny \
  > "$state/trainer.log" 2>&1 && verdict=PASS || verdict=FAIL
check trainer-libtorch "$verdict" "model init --preset tiny in the trainer image: $(tail -n 1 "$state/trainer.log")"
exit "$failed"
