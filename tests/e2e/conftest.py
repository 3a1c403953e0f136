"""Session fixtures of the end-to-end tests: one real vLLM engine shared by every module."""

from tests.support.vllm_engine import vllm_engine

__all__ = ["vllm_engine"]
