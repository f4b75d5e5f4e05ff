"""The runtime room: how a model runs a step.

    kv.py          Decoder (one sequence over transformers' cache, the reference) and OneRow, its view for the loop
    batch_kv.py    BatchDecoder: many rows in one buffer per layer, fixed-shape steps and CUDA graphs; DecoderPool
    host.py        reading results back from the device, in one place (the host syncs a step makes)
    packed_linear.py  CPU linear layers from prepacked weights (the same products, faster)
"""
