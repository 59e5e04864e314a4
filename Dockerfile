# One image for every process of the portal: web (daphne), Celery worker and beat, and the node
# agent (simulated in the demo). docker-compose.yml picks the process with `command:`; the same
# commands run without Docker from the Procfile (tests/test_compose.py checks they agree).
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    VAR_DIR=/app/var \
    STATIC_ROOT=/app/staticfiles

# acl: the agent grants GPUs with setfacl. The portal runs as an unprivileged system account.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends acl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --user-group --home-dir /app --no-create-home --shell /usr/sbin/nologin portal

WORKDIR /app

# Dependencies first, from the two pyproject.toml files alone (the portal's and the node agent's, agent/),
# so a code change does not reinstall them. The portal's dependency on gpubook-agent is the agent below.
COPY pyproject.toml README.md ./
COPY agent/pyproject.toml agent/README.md agent/
RUN python -c "import re, tomllib; deps = [d for f in ('pyproject.toml', 'agent/pyproject.toml') \
for d in tomllib.load(open(f, 'rb'))['project']['dependencies']]; \
print('\n'.join(d for d in deps if re.match(r'[A-Za-z0-9._-]+', d).group() != 'gpubook-agent'))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The code: the agent's distribution first (the gpubook-agent script), then the portal's (gpubook). collectstatic
# signs nothing, but settings refuse a guessable SECRET_KEY: a throwaway one, never kept in the image.
# PYTHONPATH=/app makes the source tree the copy of the portal that is imported: templates/ and static/
# live beside it, not in the wheel.
COPY . .
RUN pip install --no-deps ./agent \
    && pip install --no-deps . \
    && rm -rf build *.egg-info agent/build agent/*.egg-info \
    && SECRET_KEY="$(python -c 'import secrets; print(secrets.token_urlsafe(50))')" \
        python manage.py collectstatic --noinput -v0 \
    && mkdir -p var/agents \
    && chown -R portal:portal var

COPY deploy/docker-entrypoint /usr/local/bin/docker-entrypoint
USER portal
EXPOSE 8000
ENTRYPOINT ["docker-entrypoint"]
# gunicorn with WEB_PROCESSES uvicorn workers on port 8000 (portal/gunicorn_conf.py); scripts/run runs one daphne.
CMD ["gunicorn", "--config", "python:portal.gunicorn_conf", "portal.asgi:application"]
