"""What both kernel layers share: runtime detection, dtype maps, launching, sequence bounds, tile walks."""
