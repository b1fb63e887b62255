#!/bin/bash
# clusterfsdp run RUNID: written by clusterfsdp (submit, resume, or an automatic restart);
# submitting it by hand (`submit --dry-run`) behaves the same.
#SBATCH --job-name=llm
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --time=120
#SBATCH --signal=USR2@180
#SBATCH --requeue
#SBATCH --no-kill
#SBATCH --open-mode=append
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --mem=65536M
#SBATCH --partition=gpu
#SBATCH --account=proj
#SBATCH --constraint='h100&ib'
#SBATCH --gres-flags=enforce-binding
#SBATCH --reservation=big
#SBATCH --output=<TMP>/runs/llm/RUNID/submitit/%j_0_log.out
#SBATCH --error=<TMP>/runs/llm/RUNID/submitit/%j_0_log.err

# slurm.setup
module load cuda/12.4

PY=<PYTHON>
RUN=<TMP>/runs/llm/RUNID
"$PY" -m clusterfsdp.control.jobstep before "$RUN" || exit $?
srun --unbuffered --kill-on-bad-exit=1 --output=<TMP>/runs/llm/RUNID/submitit/%j_%t_log.out --error=<TMP>/runs/llm/RUNID/submitit/%j_%t_log.err <PYTHON> -u -m clusterfsdp.worker "$RUN"
exec "$PY" -m clusterfsdp.control.jobstep after "$RUN" "$?"
