"""The finetwin application: the console script, the wiring that builds the parts from settings and connects
them, one module per command group, and the migrations of the combined schema.

It sits on top of the four libraries (`twin`, `ingest`, `calibrate`, `advisor`); nothing imports it.
"""
