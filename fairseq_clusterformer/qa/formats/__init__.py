"""One small module per published QA data format; each has ``convert(path, args, log)`` yielding ``QARecord``s."""
