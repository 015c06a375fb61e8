# Sourced by the GPU scripts (gpu_figures.sh, gpu_round3.sh) with their arguments DIR TAR: each part's log goes under
# DIR, `pack` packs DIR into TAR (so a call cut short returns what finished), `stamp` adds a line to DIR/timeline.txt.
dir=${1:?usage: $0 DIR TAR}
tar_path=${2:?usage: $0 DIR TAR}
mkdir -p "$dir"
pack() { tar -czf "$tar_path" -C "$dir" .; }
stamp() { echo "[$(date -u +%T)] $*" | tee -a "$dir/timeline.txt"; }
