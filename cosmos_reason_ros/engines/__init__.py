"""Inference backends behind one small async interface (``base.Engine``)."""
