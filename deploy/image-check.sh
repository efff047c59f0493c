#!/usr/bin/env bash
# Build the image and check what it does, on a Debian machine that reaches only package
# registries (no Docker Hub): `make image-check`, run by CI after the tests. Needs root.
#
# A. a container engine from Debian (docker.io), started without touching the host's firewall;
# B. a base image from debootstrap (bookworm minbase + python3), imported, no registry;
# C. the project image built on it (BASE_IMAGE build argument), hadolint-clean;
# D. the image on its own defaults: migrate creates its SQLite file as uid 10001; with the
#    built-in development secrets it refuses to listen on 0.0.0.0; with real secrets it serves
#    /healthz, /readyz says everything but Claude (no key here) is ready, it queues a signed
#    webhook (202), runs as uid 10001, its HEALTHCHECK turns healthy, and it stops on SIGTERM
#    with exit code 0.
#
# Every step is skipped when its result exists already (the engine, the base image); the
# project image is rebuilt each time (cached layers: seconds).
set -euo pipefail

SRC=$(cd "$(dirname "$0")/.." && pwd)
LAB=${LAB:-/tmp/eventgate-image-check}
BASE=${BASE:-local/python:3.11-bookworm}
IMAGE=${IMAGE:-local/eventgate:check}
NAME=${NAME:-eventgate-image-check}
PORT=${PORT:-21080}
SOURCES=/etc/apt/sources.list.d/debian.sources
MIRROR=${MIRROR:-$(awk '/^URIs:/{print $2; exit}' "$SOURCES")}
SEC_MIRROR=${SEC_MIRROR:-$(awk '/^URIs:/{u=$2} END{print u}' "$SOURCES")}
ROOTFS=$LAB/rootfs
export DOCKER_BUILDKIT=0  # the legacy builder: no buildx plugin, nothing pulled from a registry

mkdir -p "$LAB"
step() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAILED: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- A. container engine
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v curl >/dev/null || need+=(curl)
if ((${#need[@]})); then
  step "apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" \
    >"$LAB/apt.log"
fi
if ! docker info >/dev/null 2>&1; then
  step "start dockerd (no iptables, no bridge: builds and runs use --network=host)"
  # Detached with every descriptor closed, so nothing waits on its output.
  python3 -c 'import subprocess, sys
subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=open(sys.argv[1], "a"),
                 stderr=subprocess.STDOUT, close_fds=True, start_new_session=True)' \
    "$LAB/dockerd.log" dockerd --iptables=false --ip-forward=false --bridge=none
  for _ in $(seq 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { tail -20 "$LAB/dockerd.log"; fail "dockerd did not start"; }
fi

# ---------------------------------------------------------------- B. base image
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  step "base image $BASE (debootstrap bookworm minbase + python3)"
  if mountpoint -q "$ROOTFS/proc"; then umount "$ROOTFS/proc"; fi
  rm -rf "$ROOTFS"
  debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >"$LAB/debootstrap.log"
  rm -f "$ROOTFS/etc/apt/sources.list"
  cat >"$ROOTFS/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SEC_MIRROR
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  # A dated snapshot mirror: its Release files are past Valid-Until.
  printf 'Acquire::Check-Valid-Until "false";\nAcquire::Check-Date "false";\n' \
    >"$ROOTFS/etc/apt/apt.conf.d/99snapshot-mirror"
  # pip inside the build trusts what the host trusts (an egress proxy's CA, where there is one).
  mkdir -p "$ROOTFS/usr/local/share/ca-certificates"
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
  fi
  mount -t proc proc "$ROOTFS/proc"
  trap 'mountpoint -q "$ROOTFS/proc" && umount "$ROOTFS/proc"' EXIT
  chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive sh -ec '
      apt-get update -qq
      apt-get install -y -qq --no-install-recommends python3 python3-venv python3-pip \
        python-is-python3 ca-certificates
      update-ca-certificates
      apt-get clean
      rm -rf /var/lib/apt/lists/* /tmp/*
    ' >"$LAB/chroot-apt.log" 2>&1
  umount "$ROOTFS/proc"
  trap - EXIT
  : >"$ROOTFS/etc/resolv.conf"
  tar -C "$ROOTFS" --numeric-owner --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' \
    -c . | docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' \
      --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
      - "$BASE" >/dev/null
fi

# ---------------------------------------------------------------- C. project image
step "build $IMAGE"
"$SRC/.venv/bin/hadolint" "$SRC/Dockerfile" || fail "hadolint"
docker build --network=host --force-rm --build-arg "BASE_IMAGE=$BASE" -t "$IMAGE" "$SRC" \
  >"$LAB/build.log" 2>&1 || { tail -40 "$LAB/build.log"; fail "docker build"; }
docker image ls "$IMAGE" --format '{{.Repository}}:{{.Tag}} {{.Size}}'

# ---------------------------------------------------------------- D. what it does
step "defaults: eventgate migrate creates ./eventgate.db as uid 10001"
docker run --rm --network=none "$IMAGE" sh -c 'eventgate migrate && test -O eventgate.db' \
  >"$LAB/migrate.log" 2>&1 || { tail -20 "$LAB/migrate.log"; fail "migrate on defaults"; }

step "defaults: the built-in development secrets are refused on 0.0.0.0"
set +e
docker run --rm --network=host -e EVENTGATE_PORT="$PORT" "$IMAGE" >"$LAB/dev-secrets.log" 2>&1
code=$?
set -e
[[ $code == 2 ]] || { tail -5 "$LAB/dev-secrets.log"; fail "expected exit code 2, got $code"; }
grep -q "refusing to listen on 0.0.0.0" "$LAB/dev-secrets.log" || fail "no refusal message"

step "serve with real secrets on 127.0.0.1:$PORT"
docker rm -f "$NAME" >/dev/null 2>&1 || true
cleanup() { docker rm -f "$NAME" >/dev/null 2>&1 || true; }
trap cleanup EXIT
secret=image-check-github-secret-0123456789
docker run -d --name "$NAME" --network=host -e EVENTGATE_PORT="$PORT" \
  -e GITHUB_WEBHOOK_SECRET="$secret" -e ALERTMANAGER_TOKEN=image-check-alertmanager-token \
  -e SENSORS_SECRET=image-check-sensors-secret-0123 "$IMAGE" >/dev/null
for _ in $(seq 300); do
  curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
  [[ $(docker inspect -f '{{.State.Running}}' "$NAME") == true ]] || break
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null || { docker logs "$NAME" | tail -30; fail "healthz"; }
# Not ready without ANTHROPIC_API_KEY (events wait on the queue), but everything else is.
curl -sS "http://127.0.0.1:$PORT/readyz" >"$LAB/readyz.json"
python3 - "$LAB/readyz.json" <<'EOF_PY' || { cat "$LAB/readyz.json"; fail "readyz"; }
import json, sys
checks = json.load(open(sys.argv[1]))["checks"]
assert all(checks[name] == "ok" for name in ("redis", "database", "tasks", "backlog")), checks
assert checks["llm"].startswith("not configured"), checks
EOF_PY
[[ $(docker exec "$NAME" id -u) == 10001 ]] || fail "not uid 10001"

body='{"action":"opened","issue":{"number":1,"title":"image check"},"repository":{"full_name":"acme/api"}}'
signature=$(printf '%s' "$body" | openssl dgst -sha256 -hmac "$secret" -r | cut -d' ' -f1)
status=$(curl -sS -o "$LAB/webhook.json" -w '%{http_code}' -X POST \
  "http://127.0.0.1:$PORT/v1/webhooks/github" -H 'Content-Type: application/json' \
  -H 'X-GitHub-Event: issues' -H "X-GitHub-Delivery: image-check-$$" \
  -H "X-Hub-Signature-256: sha256=$signature" --data-binary "$body")
[[ $status == 202 ]] || { cat "$LAB/webhook.json"; fail "webhook answered $status"; }

for _ in $(seq 90); do
  health=$(docker inspect -f '{{.State.Health.Status}}' "$NAME")
  [[ $health == healthy || $health == unhealthy ]] && break
  sleep 1
done
[[ $health == healthy ]] || fail "HEALTHCHECK is $health"

docker stop -t 20 "$NAME" >/dev/null
code=$(docker inspect -f '{{.State.ExitCode}}' "$NAME")
[[ $code == 0 ]] || { docker logs "$NAME" | tail -20; fail "exit code $code after SIGTERM"; }

step "image check passed"
