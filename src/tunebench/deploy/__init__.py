"""Deployment: the same tunebench command wrapped for Kubernetes (JobSet, Indexed Job, TrainJob) and Slurm."""
