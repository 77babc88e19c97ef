# Sourced by this session's call scripts: setup.sh NAME TAG...: logs under $OUT/NAME (packed
# into $OUT/NAME.tgz by pack), note() stamps a step, and each TAG's carried binaries
# (.devbin/TAG/*.xz) are unpacked into /tmp/TAG.
L=$OUT/$1; mkdir -p $L
CALL=$1; shift
export LD_LIBRARY_PATH=$PWD/.device/deps/lib/x86_64-linux-gnu
t0=$SECONDS
note() { echo "[$((SECONDS-t0)) s] $*" | tee -a $L/steps.txt; }
pack() { tar czf $OUT/$CALL.tgz -C $OUT $CALL; }
for tag in "$@"; do
  mkdir -p /tmp/$tag
  for f in .devbin/$tag/*.xz; do
    [ -f "$f" ] && (xz -dc "$f" > /tmp/$tag/$(basename "$f" .xz); chmod +x /tmp/$tag/$(basename "$f" .xz)) &
  done
done; wait
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader > $L/gpu.txt 2>&1
note "start; $(cat $L/gpu.txt)"
