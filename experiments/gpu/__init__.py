"""A lent GPU's session: what travels (carry), the script run there (session.sh), bench, cuda_check;
experiments/README.md."""
