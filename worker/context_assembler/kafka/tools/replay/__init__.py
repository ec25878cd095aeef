"""Replay input events from topic offsets or times, without joining the worker's group."""
