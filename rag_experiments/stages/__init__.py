"""Pipeline stages: each module is a Protocol plus its implementations, built from conf/<group>/."""
