"""HTTP/1.1 to the tools: the pool of connections, the strict answer reader, answer bodies."""
