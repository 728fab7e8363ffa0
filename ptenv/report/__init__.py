"""Reports of vf-eval runs of pytorch-env: python -m ptenv.report (see __main__)."""
