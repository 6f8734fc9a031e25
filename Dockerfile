# The one image of docker-compose.yml's tuner services: the tuner package on vLLM's CUDA image, so that the
# GPU workers run the real engine and every Ray node (head, service, workers) has the same Python and Ray.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.24.0
FROM ${VLLM_IMAGE}

WORKDIR /opt/tuner
COPY pyproject.toml setup.py README.md ./
COPY tuner ./tuner
# The package data of tuner.storage (its migrations) and tuner.search_spaces (the bundled spaces): setup.py.
COPY storage ./storage
COPY search_spaces ./search_spaces
# vLLM and its CUDA torch come with the base image (it satisfies the `gpu` extra); pip adds the rest.
RUN python3 -m pip install --no-cache-dir . && tuner --help >/dev/null

# The base image's entrypoint is `vllm serve`; each compose service names its own command.
ENTRYPOINT []
CMD ["tuner", "--help"]
