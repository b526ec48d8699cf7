#!/bin/sh
# Usage: disk_usage.sh [PATH] [THRESHOLD_PERCENT]
set -eu
path=${1:-/}
threshold=${2:-90}
used=$(df -P "$path" | awk 'NR == 2 { sub(/%/, "", $5); print $5 }')
echo "{\"path\": \"$path\", \"used_percent\": $used, \"threshold\": $threshold}"
[ "$used" -lt "$threshold" ]
