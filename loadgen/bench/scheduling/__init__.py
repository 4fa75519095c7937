"""Scheduling quality: berth's SLO presets against the baselines (CATO's and Aladdin's settings, the
operator's what-if), instance classes and preemption, prefix caches, batches beside interactive work,
cluster replicas."""
