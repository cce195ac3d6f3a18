# Sourced by each bench's gpu.sh, with the stack it runs on (torch or onnxruntime): from the
# repository's root, the interpreter PYTHON (python3 unset) refused unless it sees a CUDA GPU,
# the GPU named, and one GPU unless CUDA_VISIBLE_DEVICES says which.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
case "$1" in
  torch)
    "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else f"torch {torch.__version__}: no CUDA GPU")' ;;
  onnxruntime)
    "$PYTHON" -c 'import sys, onnxruntime as o; sys.exit(0 if "CUDAExecutionProvider" in o.get_available_providers() else "onnxruntime has no CUDA provider")' ;;
  *) echo "gpu_node.sh: torch or onnxruntime, not ${1:-nothing}" >&2; exit 2 ;;
esac
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
