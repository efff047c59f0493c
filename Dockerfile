# One image for every role: `eventgate serve` (default), `api`, `worker`, `migrate`.
# BASE_IMAGE: any Debian-based Python 3.11 with `python` on PATH (deploy/image-check.sh builds
# one without a registry).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
COPY pyproject.toml README.md ./
COPY app ./app
COPY eventgate_dev ./eventgate_dev
RUN /opt/venv/bin/pip install --no-cache-dir .

FROM ${BASE_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    EVENTGATE_HOST=0.0.0.0 \
    EVENTGATE_PORT=8080 \
    EVENTGATE_LOG_FORMAT=json
# The working directory belongs to the user: the default SQLite file (./eventgate.db) is
# created there (a root-owned one made the image die on its own defaults).
RUN groupadd --system --gid 10001 eventgate \
    && useradd --system --uid 10001 --gid eventgate --home-dir /srv/eventgate \
       --shell /usr/sbin/nologin eventgate \
    && install -d -o 10001 -g 10001 /srv/eventgate
WORKDIR /srv/eventgate
COPY --from=build /opt/venv /opt/venv
# app/store/migrate.py finds alembic.ini in the working directory when installed.
COPY alembic.ini ./
COPY alembic ./alembic
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('EVENTGATE_PORT', '8080'), timeout=2)"]
CMD ["eventgate", "serve"]
