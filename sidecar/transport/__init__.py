"""HTTP/1.1 to the tools: the pool of connections, the strict answer reader, and the one
seam where an attempt's foreign exceptions are translated (``exchange``)."""
