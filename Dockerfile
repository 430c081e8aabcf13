# The Quarry API image (CPU). Used by docker-compose.yml's `api` service:
#   docker build -t quarry .   &&   docker run -p 8080:8080 quarry
# Embedding runs on Triton in the compose stack (QUARRY_EMBEDDING__URL=triton+grpc://...); the
# packaged all-MiniLM-L6-v2 is still installed for the in-process default (ONNX Runtime int8,
# exported once on first start into $QUARRY_DATA_DIR/models, i.e. the /data volume) and for tests.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    QUARRY_DATA_DIR=/data \
    QUARRY_AUTH__REQUIRED=true

WORKDIR /app

# CPU-only torch first, so that sentence-transformers does not pull the CUDA wheels (GBs).
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch

COPY pyproject.toml README.md ./
COPY quarry ./quarry
COPY retrieval ./retrieval
COPY indexing ./indexing
COPY embedding ./embedding
COPY rerank ./rerank
COPY generation ./generation
COPY stores ./stores
COPY eval ./eval
RUN pip install ".[all]"

RUN useradd --create-home --uid 10001 quarry && mkdir -p /data && chown quarry:quarry /data
USER quarry
VOLUME ["/data"]
EXPOSE 8080

CMD ["quarry", "serve", "--host", "0.0.0.0", "--port", "8080"]
