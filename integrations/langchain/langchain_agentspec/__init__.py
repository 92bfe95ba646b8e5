"""LangChain integration of agentspec: session-aware speculative decoding on vLLM.

```python
from langchain_agentspec import ChatAgentSpec

llm = ChatAgentSpec(model="qwen", base_url="http://localhost:8000")
```
"""

from importlib import metadata

from langchain_agentspec.chat_models import AgentSpecSession, ChatAgentSpec

try:
    __version__ = metadata.version(__package__ or __name__)
except metadata.PackageNotFoundError:  # running from a source tree
    __version__ = ""

__all__ = ["AgentSpecSession", "ChatAgentSpec", "__version__"]
