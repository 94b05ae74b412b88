"""What both sides of the proxy share, one floor below them: a body as it arrives (and
the timeout for reading one), the one memory budget for what peers sent, the grammar of a
header line, and which headers cross the proxy."""
