"""Where records leave a query: the ack/completion channels, output sinks, dead letters."""
