# Cascade GPU image: the official vLLM image (CUDA, vLLM 0.32.0) plus the gateway.
# Build: docker build -t cascade:0.1.0 .     CPU machines: see docker-compose.yml's "cpu" profile.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CASCADE_HOST=0.0.0.0 \
    CASCADE_PORT=8000 \
    CASCADE_HOME=/var/lib/cascade \
    CASCADE_MODEL=/opt/cascade/models/pycoder-23m \
    HF_HOME=/models/hf-cache \
    NUMBA_CACHE_DIR=/var/lib/cascade/numba

WORKDIR /opt/cascade
COPY pyproject.toml README.md ./
COPY service ./service
COPY clients ./clients
COPY models ./models
COPY deploy/install.sh deploy/pip-install.sh ./deploy/

# Same steps CI runs as a script (tests/deploy/test_image_install.py): install the gateway on top
# of the image's vLLM, then drop the vision/audio packages text models never need.
RUN CASCADE_FLAVOUR=gpu sh deploy/install.sh \
    && useradd --create-home --uid 10001 cascade \
    && mkdir -p /var/lib/cascade /models/hf-cache \
    && chown -R cascade:cascade /var/lib/cascade /models

USER 10001
EXPOSE 8000
VOLUME ["/models/hf-cache", "/var/lib/cascade"]
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python3", "-m", "cascade.healthcheck"]
ENTRYPOINT ["cascade", "serve"]
