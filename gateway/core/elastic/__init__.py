"""Elastic slots: sleep and wake (``sleep``) and autoscaling decisions (``autoscale``)."""
