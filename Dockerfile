# sparkd in a container: the daemon needs only the network (SSH to the hosts, its API) and a state
# volume. Mount the config, SSH key and known_hosts read-only:
#   docker run -d --name sparkd -p 127.0.0.1:9810:9810 \
#     -v /etc/sparkd:/etc/sparkd:ro -v sparkd-state:/var/lib/sparkd sparkd
# and set daemon.listen = "0.0.0.0:9810" in the config (the port is published on loopback only).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sparkd ./sparkd
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 \
    SPARKD_CONFIG=/etc/sparkd/sparkd.toml
COPY --from=build /install /usr/local
RUN groupadd --system --gid 10810 sparkd \
    && useradd --no-log-init --system --uid 10810 --gid sparkd --home-dir /var/lib/sparkd sparkd \
    && install -d -o sparkd -g sparkd -m 0700 /var/lib/sparkd
USER sparkd
VOLUME ["/var/lib/sparkd"]
EXPOSE 9810
# The slim image has no curl; the daemon's own /healthz says whether every controller progresses.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9810/healthz', timeout=4)"]
ENTRYPOINT ["sparkd"]
CMD ["run"]
