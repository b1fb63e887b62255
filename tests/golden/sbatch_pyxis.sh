#!/bin/bash
# clusterfsdp run RUNID: written by clusterfsdp (submit, resume, or an automatic restart);
# submitting it by hand (`submit --dry-run`) behaves the same.
#SBATCH --job-name=llm
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --time=60
#SBATCH --signal=USR2@120
#SBATCH --requeue
#SBATCH --no-kill
#SBATCH --open-mode=append
#SBATCH --gpus-per-node=4
#SBATCH --partition=gpu
#SBATCH --output=<TMP>/runs/llm/RUNID/submitit/%j_0_log.out
#SBATCH --error=<TMP>/runs/llm/RUNID/submitit/%j_0_log.err

PY=<PYTHON>
RUN=<TMP>/runs/llm/RUNID
"$PY" -m clusterfsdp.control.jobstep before "$RUN" || exit $?
srun --unbuffered --kill-on-bad-exit=1 --output=<TMP>/runs/llm/RUNID/submitit/%j_%t_log.out --error=<TMP>/runs/llm/RUNID/submitit/%j_%t_log.err '--container-image=nvcr.io#nvidia/pytorch:24.05-py3' '--container-mounts=<TMP>/runs:<TMP>/runs,/shared/data:/data:ro,/scratch/x+y@z%1=~a:/scratch' --container-workdir=/shared/proj --no-container-mount-home /opt/venv/bin/python -u -m clusterfsdp.worker "$RUN"
exec "$PY" -m clusterfsdp.control.jobstep after "$RUN" "$?"
