#!/bin/bash

# Parameters
#SBATCH --error=<TMP>/runs/llm/RUNID/submitit/%j_0_log.err
#SBATCH --gpus-per-node=4
#SBATCH --job-name=llm
#SBATCH --no-kill
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --open-mode=append
#SBATCH --output=<TMP>/runs/llm/RUNID/submitit/%j_0_log.out
#SBATCH --partition=gpu
#SBATCH --requeue
#SBATCH --signal=USR2@120
#SBATCH --time=60

# setup
# clusterfsdp run RUNID: the control plane's job steps around srun (clusterfsdp.control.jobstep)
PY=<PYTHON>
RUN=<TMP>/runs/llm/RUNID
"$PY" -m clusterfsdp.control.jobstep before "$RUN" || exit $?

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output <TMP>/runs/llm/RUNID/submitit/%j_%t_log.out --error <TMP>/runs/llm/RUNID/submitit/%j_%t_log.err --kill-on-bad-exit=1 '--container-image=nvcr.io#nvidia/pytorch:24.05-py3' '--container-mounts=<TMP>/runs:<TMP>/runs,/shared/data:/data:ro,/scratch/x+y@z%1=~a:/scratch' --container-workdir=/shared/proj --no-container-mount-home /opt/venv/bin/python -u -m submitit.core._submit <TMP>/runs/llm/RUNID/submitit


# teardown
exec "$PY" -m clusterfsdp.control.jobstep after "$RUN" "$?"