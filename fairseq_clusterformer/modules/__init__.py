"""nn.Modules built on ``ops``: windowed and clustered layers, the decoder, memory banks and the K-Means hook."""
