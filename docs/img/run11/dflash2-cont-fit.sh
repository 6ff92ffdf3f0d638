#!/bin/bash
# Eleventh session, issue 18: the shipped dflash2 (version 4, the tenth session's 5,000-step refit) fitted further on
# the same 960 generated answers with the weighting the controls preferred (--decay $1), a fresh cosine schedule
# at half the learning rate; one thread on core 1, bf16 autocast. Held-out curve in dflash2-curve.json.
set -e
cd /work/main && . .venv/bin/activate
STDLIB=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
CORPUS="$STDLIB /usr/share/common-licenses py:pydoc_data.topics.topics"
OMP_NUM_THREADS=1 taskset -c 1 speclane fit-drafter --backend dflash2 --corpus $CORPUS --work /work/fit-dflash11/cont \
  --seed 0 --prompts 960 --heldout-prompts 32 --forced 0 --out /work/fit-dflash11/cont/out --steps 3000 --lr 5e-4 \
  --anchors 48 --decay $1 --init /work/main/stages/models/assets --checkpoint-every 1000 --time-limit-s 2700 --threads 1
