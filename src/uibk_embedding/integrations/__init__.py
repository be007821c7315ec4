"""Thin LangChain and LlamaIndex wrappers over the framework-neutral core."""
