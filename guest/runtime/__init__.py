"""guest runtime: ROI markers, the chase calibration program, their build and install"""
